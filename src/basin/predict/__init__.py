"""basin.predict"""
